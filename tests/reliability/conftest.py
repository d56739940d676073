from tests.fakes.aws import moto_ec2, moto_ec2_server  # noqa: F401  (fixtures)
