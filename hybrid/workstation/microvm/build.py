"""The microVM's artifacts, built here from registry packages and the base image, cached by input.

* kernel: Debian's generic ``linux-image-*-amd64`` (fetched with ``apt-get download``, so the
  machine's own apt sources say where from). Its bzImage is unpacked to the ELF ``vmlinux`` that
  QEMU boots directly (PVH); the generic flavour, not ``-cloud``, because only it ships 9p.
* initramfs: the few modules the guest needs (virtio-mmio, -blk, -console, ext4, 9p) and the
  guest agent ``guest/agent.c``, compiled here with ``cc -static`` into ``/init``: it loads the
  modules, mounts the root and serves the host, one static binary and no shell.
* rootfs: the base image (``docker export``) as an ext4 image, mounted read-only by the guest.

Each artifact lives in a directory named by a digest of its inputs, written atomically, so two
builders never see half an artifact and a change of input never reuses a stale one. The cache
is ``$HYBRID_MICROVM_CACHE`` (default ``~/.cache/hybrid/microvm``): it does not follow
``$HYBRID_CACHE_DIR`` on purpose, since the artifacts are large, immutable and safe to share
between test sessions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from hybrid.errors import EngineUnavailable, WorkstationError

KERNEL_META = "linux-image-amd64"
"""The Debian meta package naming the current generic kernel."""
MODULES = (
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "crc32c_generic",
    "ext4",
    "overlay",
    "9pnet_virtio",
    "9p",
)
"""Guest modules to load, dependencies first (their own dependencies are added)."""
COMPILER = "cc"
INITRAMFS_LAYOUT = "3"
"""Bumped when _initramfs writes its inputs differently (2: modules without signatures; 3: the
compiled agent is /init)."""
SIGNATURE_MAGIC = b"~Module signature appended~\n"
GUEST = Path(__file__).parent / "guest"
Progress = Callable[[str], None]


class Artifacts(BaseModel):
    """What a microVM boots: kernel, initramfs and root filesystem."""

    kernel: Path = Field(description="Uncompressed ELF vmlinux (PVH entry).")
    initramfs: Path = Field(description="newc cpio: the modules and the guest agent as /init.")
    rootfs: Path = Field(description="ext4 image of the base image, attached read-only.")
    key: str = Field(description="Digest of every input: names the snapshots made from them.")
    kernel_package: str


def cache() -> Path:
    """Where the artifacts live (see the module docstring)."""
    root = os.environ.get("HYBRID_MICROVM_CACHE")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        path = Path(base) / "hybrid" / "microvm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def ensure(image: str | None = None, on_progress: Progress | None = None) -> Artifacts:
    """Build what is missing (kernel, initramfs, rootfs) and return the paths."""
    say = on_progress or (lambda _line: None)
    package = _kernel_package()
    kernel_dir = _kernel(package, say)
    initramfs = _initramfs(kernel_dir, say)
    rootfs = _rootfs(image, say)
    key = _digest(package, initramfs.parent.name, rootfs.parent.name)
    return Artifacts(
        kernel=kernel_dir / "vmlinux",
        initramfs=initramfs,
        rootfs=rootfs,
        key=key,
        kernel_package=package,
    )


def built(image: str | None = None) -> Artifacts | None:
    """The artifacts if all three are built, and from this version's guest sources (no apt,
    engine or build call beyond lookups)."""
    found = _recorded()
    if found is None:
        return None
    if not all(p.exists() for p in (found.kernel, found.initramfs, found.rootfs)):
        return None
    if found.initramfs.parent.name != _initramfs_dir(found.kernel.parent).name:
        return None  # built from an older guest agent or init: the host expects this one
    return found


def _recorded() -> Artifacts | None:
    """What ``current.json`` names, built or not."""
    try:
        return Artifacts.model_validate_json((cache() / "current.json").read_text())
    except (OSError, ValueError):
        return None


def build(image: str | None = None, on_progress: Progress | None = None) -> Artifacts:
    """ensure() and record the result as the current artifacts (what the tier boots)."""
    made = ensure(image, on_progress)
    _write_atomic(cache() / "current.json", made.model_dump_json().encode())
    return made


class CacheUsage(BaseModel):
    """What the microVM cache holds: the current artifacts, their VM templates, and what
    nothing boots any more (artifacts of an older agent or kernel, their templates, builds
    a crash left)."""

    current_bytes: int = 0
    templates: int = 0
    templates_bytes: int = 0
    stale: list[str] = Field(default_factory=list, description="names under the cache")
    stale_bytes: int = 0


def _bytes(path: Path) -> int:
    """Disk space ``path`` takes (a rootfs image is sparse: its size says little)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(
        p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink()
    )


def cache_usage() -> CacheUsage:
    """Sizes of the current artifacts, their templates and everything stale."""
    root = cache()
    usage = CacheUsage()
    if not root.is_dir():
        return usage
    current, recorded = built(), _recorded()
    keep: set[str] = set()
    if recorded is not None:
        # an upgrade's next build reuses the recorded kernel and rootfs: only the agent moves
        keep |= {recorded.kernel.parent.name, recorded.rootfs.parent.name}
    if current is not None:
        keep.add(current.initramfs.parent.name)
    cutoff = time.time() - 3600  # a build in progress is younger
    for path in sorted(root.iterdir()):
        if path.name in keep:
            usage.current_bytes += _bytes(path)
        elif path.name.startswith(("kernel-", "initramfs-", "rootfs-")) or (
            path.name.startswith(".") and path.stat().st_mtime < cutoff
        ):
            usage.stale.append(path.name)
            usage.stale_bytes += _bytes(path)
    templates = root / "templates"
    for path in sorted(templates.iterdir()) if templates.is_dir() else []:
        if current is not None and path.name.startswith(f"{current.key}-"):
            usage.templates += 1
            usage.templates_bytes += _bytes(path)
        elif not path.name.startswith(".") or path.stat().st_mtime < cutoff:
            usage.stale.append(f"templates/{path.name}")
            usage.stale_bytes += _bytes(path)
    return usage


def prune_cache() -> CacheUsage:
    """Remove what ``cache_usage`` finds stale; returns what was removed."""
    found = cache_usage()
    removed = CacheUsage(stale=[], stale_bytes=0)
    for name in found.stale:
        path = cache() / name
        size = _bytes(path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if not path.exists():
            removed.stale.append(name)
            removed.stale_bytes += size
    return removed


# -- kernel -----------------------------------------------------------------------------------


def _kernel_package() -> str:
    """``linux-image-<abi>-amd64=<version>`` the meta package points at, from apt's cache."""
    depends = _run(["apt-cache", "depends", KERNEL_META], "finding the guest kernel")
    found = re.search(r"Depends:\s*(linux-image-\S+-amd64)\b", depends)
    if not found:
        raise EngineUnavailable(
            f"apt knows no {KERNEL_META} (run apt-get update; the microvm tier needs the Debian kernel)"
        )
    name = found.group(1)
    shown = _run(["apt-cache", "show", "--no-all-versions", name], "finding the guest kernel")
    version = re.search(r"^Version:\s*(\S+)", shown, re.M)
    return f"{name}={version.group(1) if version else 'unknown'}"


def _kernel(package: str, say: Progress) -> Path:
    out = cache() / f"kernel-{_digest(package, *MODULES)}"
    if (out / "vmlinux").exists():
        return out
    with _building(out) as tmp:
        say(f"downloading {package}")
        _run(["apt-get", "download", package], "downloading the guest kernel", cwd=tmp)
        deb = next(tmp.glob("*.deb"))
        _run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], "unpacking the guest kernel")
        vmlinuz = next((tmp / "x" / "boot").glob("vmlinuz-*"))
        say("unpacking vmlinux")
        (tmp / "vmlinux").write_bytes(_vmlinux(vmlinuz.read_bytes()))
        modules = next((tmp / "x" / "lib" / "modules").iterdir()) / "kernel"
        index = {p.name.split(".ko")[0].replace("-", "_"): p for p in modules.rglob("*.ko")}
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            if name not in index:
                raise WorkstationError(f"the guest kernel {package} has no module {name}")
            for dep in _depends(index[name]):
                visit(dep)
            order.append(name)

        for name in MODULES:
            visit(name)
        (tmp / "modules").mkdir()
        for name in order:
            shutil.copy(index[name], tmp / "modules" / f"{name}.ko")
        (tmp / "modules.order").write_text("\n".join(order) + "\n")
        shutil.rmtree(tmp / "x")
        deb.unlink()
    return out


def _vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a bzImage (xz, gzip, zstd or lz4 payload)."""
    for magic, unpack in (
        (b"\xfd7zXZ\x00", lambda data: lzma.LZMADecompressor().decompress(data)),
        (b"\x1f\x8b\x08\x00", _gunzip),
        (b"\x02\x21\x4c\x18", _lz4),
    ):
        at = bzimage.find(magic)
        while at >= 0:
            with contextlib.suppress(Exception):
                elf = unpack(bzimage[at:])
                if elf[:4] == b"\x7fELF":
                    return elf
            at = bzimage.find(magic, at + 1)
    raise WorkstationError("no ELF kernel found inside the guest kernel's bzImage")


def _gunzip(data: bytes) -> bytes:
    import zlib

    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)


def _lz4(data: bytes) -> bytes:
    done = subprocess.run(["lz4", "-dc"], input=data, capture_output=True)
    return done.stdout


def _depends(module: Path) -> list[str]:
    found = re.search(rb"depends=([^\x00]*)\x00", module.read_bytes())
    return [d for d in (found.group(1).decode().split(",") if found else []) if d]


# -- initramfs --------------------------------------------------------------------------------


def _initramfs_dir(kernel_dir: Path) -> Path:
    """Where the initramfs of this guest agent (source and compiler) for this kernel lives."""
    key = _digest(INITRAMFS_LAYOUT, kernel_dir.name, *_guest_hashes())
    return cache() / f"initramfs-{key}"


@functools.cache
def _guest_hashes() -> tuple[str, ...]:
    # Once per process: built() runs on every VM create and listing.
    return (_hash((GUEST / "agent.c").read_bytes()), _hash(_compiler().encode()))


@functools.cache
def _compiler() -> str:
    """The C compiler's version line ('' without one: then building says how to get it)."""
    with contextlib.suppress(OSError):
        done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True)
        return (done.stdout.splitlines() or [""])[0]
    return ""


def _initramfs(kernel_dir: Path, say: Progress) -> Path:
    out = _initramfs_dir(kernel_dir)
    target = out / "initramfs.cpio"
    if target.exists():
        return target
    if not _compiler():
        raise EngineUnavailable(
            "the microvm guest agent is compiled here: apt-get install gcc libc6-dev"
        )
    with _building(out) as tmp:
        say("compiling the guest agent")
        _run(
            [COMPILER, "-static", "-O2", "-o", str(tmp / "init"), str(GUEST / "agent.c"), "-lm"],
            "compiling the guest agent (apt-get install gcc libc6-dev)",
        )
        say("writing the initramfs")
        entries: list[tuple[str, int, bytes]] = [
            ("dev", 0o40755, b""),
            ("proc", 0o40755, b""),
            ("sys", 0o40755, b""),
            ("newroot", 0o40755, b""),
            ("lower", 0o40755, b""),
            ("upper", 0o40755, b""),
            ("lib", 0o40755, b""),
            ("lib/modules", 0o40755, b""),
            ("init", 0o100755, (tmp / "init").read_bytes()),
            ("modules.order", 0o100644, (kernel_dir / "modules.order").read_bytes()),
        ]
        for module in sorted((kernel_dir / "modules").iterdir()):
            data = _unsigned(module.read_bytes())
            entries.append((f"lib/modules/{module.name}", 0o100644, data))
        (tmp / "initramfs.cpio").write_bytes(_cpio(entries))
        (tmp / "init").unlink()
    return target


def _unsigned(module: bytes) -> bytes:
    """``module`` without its appended signature.

    The guest kernel does not enforce signatures, and checking one (a hash of the whole module
    and an RSA verify) is slow under emulation: ext4 alone is 2 MB. The modules come from the
    Debian package this build fetched; an unsigned module only taints the kernel's log.
    """
    if not module.endswith(SIGNATURE_MAGIC):
        return module
    # struct module_signature (12 bytes, its last 4 the big-endian signature length), then magic
    end = len(module) - len(SIGNATURE_MAGIC)
    length = int.from_bytes(module[end - 4 : end], "big")
    return module[: end - 12 - length]


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (symlinks: data is the target)."""
    out = io.BytesIO()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\x00"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        header = b"070701" + b"".join(b"%08X" % f for f in fields)
        out.write(header + encoded)
        out.write(b"\x00" * (-(len(header) + len(encoded)) % 4))
        out.write(data)
        out.write(b"\x00" * (-len(data) % 4))
    return out.getvalue()


# -- root filesystem --------------------------------------------------------------------------


def _rootfs(image: str | None, say: Progress) -> Path:
    from hybrid.workstation import images
    from hybrid.workstation.docker import client
    from hybrid.workstation.docker.engine import translate

    tag = image or images.BASE_IMAGE
    found = images.get(tag)
    if found is None:
        raise EngineUnavailable(
            f"the microvm root filesystem is built from {tag}, which is missing "
            "(hybrid image bootstrap builds it)"
        )
    out = cache() / f"rootfs-{_digest(found.id)}"
    target = out / "rootfs.ext4"
    if target.exists():
        return target
    if shutil.which("mkfs.ext4") is None:
        raise EngineUnavailable(
            "the microvm root filesystem needs mkfs.ext4 (apt-get install e2fsprogs)"
        )
    with _building(out) as tmp:
        say(f"exporting {tag}")
        tree = tmp / "tree"
        tree.mkdir()
        # No hybrid labels: the export container is short-lived and no gc may take it mid-export.
        with translate(f"exporting {tag}"):
            made = client().containers.create(
                tag, ["true"], name=f"microvm-rootfs-export-{os.getpid()}-{os.urandom(3).hex()}"
            )
            try:
                untar = subprocess.Popen(
                    ["tar", "-x", "--numeric-owner", "-C", str(tree)],
                    stdin=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                assert untar.stdin is not None
                try:
                    for chunk in made.export():
                        untar.stdin.write(chunk)
                finally:
                    untar.stdin.close()
                    untar.wait()
                if untar.returncode != 0:
                    raise WorkstationError(f"unpacking {tag} failed")
            finally:
                made.remove(force=True)
        for place in ("workspace", "run", "tmp"):
            (tree / place).mkdir(exist_ok=True)
        used = sum(p.lstat().st_size for p in tree.rglob("*"))
        size = (used * 13 // 10 + 96 * 1024**2) // 4096 * 4096
        say(f"writing the root filesystem ({size // 1024**2} MB)")
        with open(tmp / "rootfs.ext4", "wb") as handle:
            handle.truncate(size)
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-O",
                "^has_journal",
                "-L",
                "hybrid-root",
                "-d",
                str(tree),
                str(tmp / "rootfs.ext4"),
            ],
            "writing the root filesystem",
        )
        shutil.rmtree(tree)
    return target


# -- helpers ----------------------------------------------------------------------------------


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _building(out: Path) -> Iterator[Path]:
    """A private directory renamed to ``out`` on success, removed on failure."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another builder won the race: same bytes
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    if shutil.which(argv[0]) is None:
        raise EngineUnavailable(f"{what}: {argv[0]} is not installed")
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        raise WorkstationError(f"{what}: {argv[0]}: {last[:200]}")
    return done.stdout
