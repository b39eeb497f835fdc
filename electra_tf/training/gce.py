"""The Google Compute Engine VM this process may run on (Cloud TPU VMs included): whether
it is one, and its metadata server."""

import os
import urllib.request
from typing import Optional

# TensorFlow's name for the metadata server's address (tests point it at a fake server);
# Google's client libraries also read GCE_METADATA_HOST.
METADATA_HOST_ENV = "GCE_METADATA_IP"


def on_gce() -> bool:
    """Whether this machine is a GCE VM, from the DMI product name as Google's client
    libraries check it (no network), or forced by the metadata address variable."""
    if os.environ.get(METADATA_HOST_ENV):
        return True
    try:
        with open("/sys/class/dmi/id/product_name") as f:  # local: /sys
            return f.read().strip().startswith("Google")
    except OSError:
        return False


def metadata(path: str, host: Optional[str] = None, timeout: float = 2.0) -> str:
    """The metadata server's value at computeMetadata/v1/PATH for this VM (stripped).
    Raises OSError (or ValueError for a bad host) when it cannot be read."""
    host = (host or os.environ.get("GCE_METADATA_HOST") or os.environ.get(METADATA_HOST_ENV)
            or "metadata.google.internal")
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode("utf-8").strip()


def attribute(name: str) -> Optional[str]:
    """This VM's instance attribute `name` (accelerator-type, agent-worker-number), or None
    when it is empty or the metadata server cannot be read."""
    try:
        return metadata(f"instance/attributes/{name}") or None
    except (OSError, ValueError):
        return None
