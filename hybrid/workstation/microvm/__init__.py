"""The microVM workstation backend (tier ``microvm``): QEMU ``-M microvm`` with a guest agent.

``build`` makes the artifacts, ``vm`` runs one QEMU process, ``backend`` is the Backend and
Workstation; ``guest/`` holds what runs inside (init and the agent).
"""

from hybrid.workstation.microvm.backend import MicrovmBackend, MicrovmWorkstation

__all__ = ["MicrovmBackend", "MicrovmWorkstation"]
