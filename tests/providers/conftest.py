"""Provider test fixtures: the moto EC2 server (once per session) lives in tests/fakes/aws.py."""

from tests.fakes.aws import moto_ec2, moto_ec2_server  # noqa: F401  (fixtures)
from tests.providers_cloud.conftest import _azure_server, _gcp_server, azure_fake, gcp_fake  # noqa: F401  (fixtures)
