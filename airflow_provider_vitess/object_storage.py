"""S3 settings from an Airflow ``aws`` connection, for both sides of a sync (pure: no I/O, no Airflow).

Staging goes through fsspec (``s3fs``, in the capture task and in the merge job's driver) and
Delta through Hadoop's S3A (Spark's ``s3a://``). Both must reach the same bucket with the same
credentials and endpoint, which come from one Airflow connection (``aws_conn_id``) and are
turned here into what each side takes:

* :meth:`S3Settings.storage_options`: ``s3fs.S3FileSystem`` keyword arguments (capture side);
* :meth:`S3Settings.environment`: the variables the merge operator sets in the environment of
  the spark-submit process only, never on its command line (spark-submit command lines are
  logged, and rendered operator fields are shown in the UI);
* :meth:`S3Settings.from_environment` then :meth:`S3Settings.hadoop_conf` and
  :meth:`S3Settings.storage_options`: what the merge job's driver sets programmatically on its
  Spark session and on fsspec from those variables (Hadoop's configuration reaches the
  executors with each task, wherever they run).

The connection's fields are read the way Airflow's Amazon provider documents them (login /
password = access key id / secret key; extras ``aws_session_token``, ``region_name``,
``endpoint_url``, ``service_config.s3.endpoint_url``, ``config_kwargs``), so a connection made
for that provider works here without installing it. Without keys, both sides fall back to the
AWS default credential chain (environment, instance role...). Extras that choose *which*
credentials (an assumed role, a profile, a web identity) are resolved by the Amazon provider's
hook when it is installed (:func:`airflow_provider_vitess.connections.s3_settings`), and refused,
naming it, when it is not: never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from airflow_provider_vitess.exceptions import VitessConnectionError

# Standard AWS variable names: botocore and the AWS SDKs read them too, and a user running the
# merge job by hand exports the usual ones.
ENV_ACCESS_KEY = "AWS_ACCESS_KEY_ID"
ENV_SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
ENV_SESSION_TOKEN = "AWS_SESSION_TOKEN"
ENV_ENDPOINT = "AWS_ENDPOINT_URL_S3"
ENV_ENDPOINT_ANY = "AWS_ENDPOINT_URL"
ENV_REGION = "AWS_REGION"
ENV_DEFAULT_REGION = "AWS_DEFAULT_REGION"
# No AWS variable says "path-style addressing"; this one is ours.
ENV_ADDRESSING_STYLE = "VITESS_S3_ADDRESSING_STYLE"

CONN_TYPES = ("aws", "s3")
# Extras that change *which* credentials are used: only the Amazon provider's hook resolves them
# (ignoring them would act as someone else).
HOOK_EXTRAS = (
    "role_arn",
    "assume_role_method",
    "assume_role_kwargs",
    "profile_name",
    "aws_web_identity_token_file",
)
_KNOWN_EXTRAS = frozenset(
    {
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "region_name",
        "endpoint_url",
        "service_config",
        "config_kwargs",
    }
)
_S3A = "spark.hadoop.fs.s3a."


def hook_extras(extra: Mapping[str, Any]) -> list[str]:
    """The extras of :data:`HOOK_EXTRAS` a connection sets: its keys come from the Amazon
    provider's hook."""
    return [k for k in HOOK_EXTRAS if extra.get(k)]


class Credentials(NamedTuple):
    """Keys resolved for one task (the shape of botocore's frozen credentials)."""

    access_key: str
    secret_key: str
    token: str | None = None


def is_s3_url(location: str) -> bool:
    """Whether a location is an S3 URL (``s3://``, ``s3a://``, ``s3n://``)."""
    return location.split("://", 1)[0].lower() in ("s3", "s3a", "s3n") and "://" in location


@dataclass(frozen=True)
class S3Settings:
    """Where an S3 bucket is served and with which credentials. Secrets are kept out of ``repr``."""

    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    # botocore ``Config`` arguments (retries, timeouts...), for s3fs only.
    botocore_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise VitessConnectionError(
                "the aws connection has an access key id without a secret key or the other way "
                "round: set both (login and password), or neither to use the default credential chain"
            )
        if self.endpoint_url and not self.endpoint_url.startswith(("http://", "https://")):
            raise VitessConnectionError(
                f"endpoint_url {self.endpoint_url!r} of the aws connection must start with http:// or https://"
            )

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values that must never appear in a log."""
        return tuple(s for s in (self.secret_access_key, self.session_token) if s)

    # -- from an Airflow connection ---------------------------------------------------------------

    @classmethod
    def from_connection(
        cls, *, conn_id: str, conn_type: str | None, login: str | None, password: str | None,
        extra: Mapping[str, Any], resolved: Credentials | None = None,
    ) -> S3Settings:  # fmt: skip
        """Settings from an Airflow connection's parts; raises naming the field on anything unusable.

        ``resolved``: the keys the Amazon provider's hook resolved for a connection with
        :data:`HOOK_EXTRAS` (they replace the connection's own); without them such extras are refused."""
        if (conn_type or "").lower() not in CONN_TYPES:
            raise VitessConnectionError(
                f"connection {conn_id!r} has type {conn_type!r}; object storage needs an 'aws' connection "
                "(login = access key id, password = secret key, extra endpoint_url for an S3-compatible "
                "server)"
            )
        hooked = hook_extras(extra)
        if hooked and resolved is None:
            raise VitessConnectionError(
                f"connection {conn_id!r}: extra(s) {', '.join(map(repr, hooked))} choose the credentials "
                "through the Amazon provider's hook, which is not installed: pip install "
                "apache-airflow-providers-amazon on the workers; or give the connection keys, or leave "
                "them out and give the workers and Spark a role of their own"
            )
        unknown = sorted(set(extra) - _KNOWN_EXTRAS - set(HOOK_EXTRAS))
        if unknown:
            raise VitessConnectionError(
                f"connection {conn_id!r}: unknown extra(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(_KNOWN_EXTRAS))}"
            )
        service = dict(dict(extra.get("service_config") or {}).get("s3") or {})
        config = dict(extra.get("config_kwargs") or {})
        endpoint = service.get("endpoint_url") or extra.get("endpoint_url") or None
        style = str(dict(config.get("s3") or {}).get("addressing_style") or "").lower()
        if style not in ("", "auto", "path", "virtual"):
            raise VitessConnectionError(
                f"connection {conn_id!r}: config_kwargs.s3.addressing_style must be path, virtual or auto, "
                f"got {style!r}"
            )
        keys = resolved or Credentials(
            login or extra.get("aws_access_key_id") or "",
            password or extra.get("aws_secret_access_key") or "",
            extra.get("aws_session_token") or None,
        )
        return cls(
            access_key_id=keys.access_key or None,
            secret_access_key=keys.secret_key or None,
            session_token=keys.token or None,
            endpoint_url=endpoint,
            region=extra.get("region_name") or None,
            # S3-compatible servers are addressed by path unless told otherwise; AWS by host.
            path_style=style == "path" or (bool(endpoint) and style != "virtual"),
            botocore_config=config,
        )

    # -- the process environment of the merge job -------------------------------------------------

    def environment(self) -> dict[str, str]:
        """Variables for the merge job's process environment (includes the secrets)."""
        env = {
            ENV_ACCESS_KEY: self.access_key_id,
            ENV_SECRET_KEY: self.secret_access_key,
            ENV_SESSION_TOKEN: self.session_token,
            ENV_ENDPOINT: self.endpoint_url,
            ENV_REGION: self.region,
            ENV_ADDRESSING_STYLE: "path" if self.path_style else None,
        }
        return {k: v for k, v in env.items() if v}

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> S3Settings | None:
        """What :meth:`environment` wrote (or the usual AWS variables); None when none is set."""
        endpoint = env.get(ENV_ENDPOINT) or env.get(ENV_ENDPOINT_ANY) or None
        settings = cls(
            access_key_id=env.get(ENV_ACCESS_KEY) or None,
            secret_access_key=env.get(ENV_SECRET_KEY) or None,
            session_token=env.get(ENV_SESSION_TOKEN) or None,
            endpoint_url=endpoint,
            region=env.get(ENV_REGION) or env.get(ENV_DEFAULT_REGION) or None,
            path_style=env.get(ENV_ADDRESSING_STYLE, "").lower() == "path",
        )
        return None if settings == cls() else settings

    # -- what each side takes ---------------------------------------------------------------------

    def storage_options(self) -> dict[str, Any]:
        """``s3fs.S3FileSystem`` arguments."""
        options: dict[str, Any] = {}
        if self.access_key_id:
            options.update(key=self.access_key_id, secret=self.secret_access_key)
        if self.session_token:
            options["token"] = self.session_token
        if self.endpoint_url:
            options["endpoint_url"] = self.endpoint_url
        client: dict[str, Any] = {}
        if self.region:
            client["region_name"] = self.region
        if client:
            options["client_kwargs"] = client
        config = {k: v for k, v in self.botocore_config.items() if k != "s3"}
        s3_config = dict(dict(self.botocore_config).get("s3") or {})
        if self.path_style:
            s3_config["addressing_style"] = "path"
        if s3_config:
            config["s3"] = s3_config
        if config:
            options["config_kwargs"] = config
        return options

    def hadoop_conf(self) -> dict[str, str]:
        """Spark settings for Hadoop's S3A (``spark.hadoop.fs.s3a.*``), set on the session by the
        job itself, never passed as ``--conf``: they include the secret key."""
        conf: dict[str, str] = {}
        if self.access_key_id:
            assert self.secret_access_key is not None
            conf[_S3A + "access.key"] = self.access_key_id
            conf[_S3A + "secret.key"] = self.secret_access_key
            provider = "SimpleAWSCredentialsProvider"
            if self.session_token:
                conf[_S3A + "session.token"] = self.session_token
                provider = "TemporaryAWSCredentialsProvider"
            # Only these keys: S3A's default chain would otherwise also try instance metadata.
            conf[_S3A + "aws.credentials.provider"] = f"org.apache.hadoop.fs.s3a.{provider}"
        if self.endpoint_url:
            conf[_S3A + "endpoint"] = self.endpoint_url
            conf[_S3A + "connection.ssl.enabled"] = str(self.endpoint_url.startswith("https://")).lower()
        if self.region:
            conf[_S3A + "endpoint.region"] = self.region
        if self.path_style:
            conf[_S3A + "path.style.access"] = "true"
        return conf
