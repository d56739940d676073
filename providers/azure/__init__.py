"""Azure VM pools (azure-mgmt-compute, azure-mgmt-network, azure-identity; imported lazily)."""

from providers.azure.driver import AzureProvider, vm_name
from providers.azure.settings import AzureSettings

__all__ = ["AzureProvider", "AzureSettings", "vm_name"]
