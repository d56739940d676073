"""AWS EC2 backend (boto3, the `aws` extra): see `driver` for the launch path."""

from providers.aws.driver import AwsProvider, client_token, parse_interruption
from providers.aws.errors import map_error
from providers.aws.settings import AwsSettings

__all__ = ["AwsProvider", "AwsSettings", "client_token", "map_error", "parse_interruption"]
