"""Build the built-in check modules (wasm_modules/checks) and ship them in hybrid/wasm/modules.

    python wasm_modules/build.py           build, copy the .wasm files, write manifest.json
    python wasm_modules/build.py --check   verify the shipped modules match their sources

The toolchain is Debian's: rustc 1.63 with its wasm32-wasi standard library
(apt: rustc cargo libstd-rust-dev-wasm32 lld-14 librust-regex-dev librust-csv-dev
librust-serde-json-dev librust-serde-derive-dev), building offline against the packaged crates.
The build is reproducible: it always runs from a copy of the crate at a fixed path with fixed
path remaps, so the bytes depend on the sources and the toolchain only, never on the checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRATE = HERE / "checks"
REPO = HERE.parent
OUT = REPO / "hybrid" / "wasm" / "modules"
NAMES = ("csv", "json", "grep", "redact", "scope")
TARGET = "wasm32-wasi"
CARGO = "/usr/bin/cargo"
RUSTC = "/usr/bin/rustc"
REGISTRY = "/usr/share/cargo/registry"
# Where the crate is built from: a fixed path, so no checkout path can reach the binary or the
# crate metadata hash (cargo 1.65 hashes RUSTFLAGS into it).
BUILD_ROOT = Path("/tmp/hybrid-wasm-build")
STACK_BYTES = 256 * 1024
RUSTFLAGS = " ".join(
    [
        f"--remap-path-prefix={BUILD_ROOT}=/hybrid",
        f"--remap-path-prefix={REGISTRY}=/cargo/registry",
        f"-C link-arg=-zstack-size={STACK_BYTES}",
    ]
)


def source_files(crate: Path = CRATE, name: str | None = None) -> list[Path]:
    """The files a module is built from (all modules when ``name`` is None)."""
    files = [crate / "Cargo.toml", crate / "Cargo.lock", crate / ".cargo" / "config.toml"]
    files.append(crate / "src" / "lib.rs")
    if name is None:
        files += sorted((crate / "src" / "bin").glob("*.rs"))
    else:
        files.append(crate / "src" / "bin" / f"{name}.rs")
    return files


def source_hash(name: str, crate: Path = CRATE) -> str:
    """sha256 over one module's sources and the build flags."""
    digest = hashlib.sha256()
    digest.update(f"flags={RUSTFLAGS}\0target={TARGET}\0".encode())
    for path in source_files(crate, name):
        digest.update(path.relative_to(crate).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def toolchain() -> str | None:
    """The rustc version line when cargo, rustc and the wasm32-wasi std are all present."""
    if not (Path(CARGO).exists() and Path(RUSTC).exists()):
        return None
    try:
        sysroot = subprocess.run(
            [RUSTC, "--print", "sysroot"], capture_output=True, text=True, check=True
        ).stdout.strip()
        version = subprocess.run(
            [RUSTC, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    if not (Path(sysroot) / "lib" / "rustlib" / TARGET / "lib").is_dir():
        return None
    # rustc's wasm linker is /usr/bin/rust-lld, a link to lld-14 (only recommended by the std).
    if not Path("/usr/bin/rust-lld").resolve().exists():
        return None
    return version


def build(target_dir: Path) -> dict[str, bytes]:
    """Build every module from a copy of the crate at BUILD_ROOT; return name -> wasm bytes."""
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    lock = BUILD_ROOT / ".lock"
    import fcntl

    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one build at a time may own the fixed path
        work = BUILD_ROOT / "checks"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(CRATE, work, ignore=shutil.ignore_patterns("target"))
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(target_dir),
            "CARGO_HOME": str(target_dir / "cargo-home"),
            "CARGO_TARGET_DIR": str(target_dir),
            "RUSTC": RUSTC,
            "RUSTFLAGS": RUSTFLAGS,
            "CARGO_INCREMENTAL": "0",
            "SOURCE_DATE_EPOCH": "0",
            "LC_ALL": "C",
            "TZ": "UTC",
        }
        command = [CARGO, "build", "--release", "--locked", "--offline", "--target", TARGET]
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"build.py: cargo build failed (exit {done.returncode})")
        release = target_dir / TARGET / "release"
        return {name: (release / f"{name}.wasm").read_bytes() for name in NAMES}


def manifest(modules: dict[str, bytes], rustc: str) -> dict[str, object]:
    return {
        "toolchain": rustc,
        "target": TARGET,
        "build": "python wasm_modules/build.py",
        "modules": {
            name: {
                "file": f"{name}.wasm",
                "bytes": len(modules[name]),
                "sha256": hashlib.sha256(modules[name]).hexdigest(),
                "source_sha256": source_hash(name),
            }
            for name in NAMES
        },
    }


def write(modules: dict[str, bytes], rustc: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, data in modules.items():
        (OUT / f"{name}.wasm").write_bytes(data)
    text = json.dumps(manifest(modules, rustc), indent=2, sort_keys=True) + "\n"
    (OUT / "manifest.json").write_text(text, encoding="utf-8")


def check_sources() -> list[str]:
    """Problems with the shipped modules that need no toolchain to see."""
    path = OUT / "manifest.json"
    if not path.exists():
        return [f"{path} is missing: run python wasm_modules/build.py"]
    shipped = json.loads(path.read_text(encoding="utf-8"))["modules"]
    problems = []
    for name in NAMES:
        entry = shipped.get(name)
        wasm = OUT / f"{name}.wasm"
        if entry is None or not wasm.exists():
            problems.append(f"{name}: not shipped: run python wasm_modules/build.py")
            continue
        if entry["source_sha256"] != source_hash(name):
            problems.append(
                f"{name}: sources changed since the module was built: run python wasm_modules/build.py"
            )
        if entry["sha256"] != hashlib.sha256(wasm.read_bytes()).hexdigest():
            problems.append(f"{name}: {wasm.name} does not match the sha256 in manifest.json")
    return problems


def check_rebuild() -> list[str]:
    """Rebuild in a fresh target directory and compare byte for byte."""
    with tempfile.TemporaryDirectory(prefix="hybrid-wasm-check-") as tmp:
        built = build(Path(tmp))
    problems = []
    for name, data in built.items():
        shipped = OUT / f"{name}.wasm"
        if not shipped.exists() or shipped.read_bytes() != data:
            problems.append(
                f"{name}: rebuilt module differs from the shipped {shipped.name} "
                f"(rebuilt sha256 {hashlib.sha256(data).hexdigest()[:16]})"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument(
        "--target-dir", type=Path, default=HERE / "target", help="cargo target dir for builds"
    )
    args = parser.parse_args(argv)
    rustc = toolchain()
    if args.check:
        problems = check_sources()
        if rustc is None:
            print(
                "build.py: Rust wasm32-wasi toolchain not found: byte-identical rebuild check skipped"
            )
        else:
            problems += check_rebuild()
        for problem in problems:
            print(f"build.py: {problem}", file=sys.stderr)
        if not problems:
            print(
                "build.py: shipped modules match their sources"
                + ("" if rustc is None else " (rebuilt byte-identical)")
            )
        return 1 if problems else 0
    if rustc is None:
        print(
            "build.py: needs /usr/bin/cargo, /usr/bin/rustc and the wasm32-wasi std: apt-get install -y "
            "rustc cargo libstd-rust-dev-wasm32 lld-14 librust-regex-dev librust-csv-dev librust-serde-json-dev "
            "librust-serde-derive-dev",
            file=sys.stderr,
        )
        return 2
    modules = build(args.target_dir.resolve())
    write(modules, rustc)
    for name in NAMES:
        print(f"{name}.wasm  {len(modules[name]):>8} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
