"""Google Compute Engine pools (google-cloud-compute, imported lazily by the driver)."""

from providers.gcp.driver import GcpProvider
from providers.gcp.settings import GcpSettings

__all__ = ["GcpProvider", "GcpSettings"]
