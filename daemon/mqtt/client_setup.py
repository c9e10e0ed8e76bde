"""The paho client as ``[mqtt]`` describes it, and what an operator reads when connecting fails."""

from __future__ import annotations

import ssl

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edgepilot.config import MqttSection, MqttTlsSection
from edgepilot.errors import ConfigError


def make_client(cfg: MqttSection, client_id: str, will_topic: str, offline: bytes
                ) -> mqtt.Client:
    """A paho 2.x client (no callbacks yet): protocol, credentials, TLS, will, backoff."""
    if cfg.protocol == "5":
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv5)
    else:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv311, clean_session=True)
    if cfg.username is not None:
        client.username_pw_set(cfg.username, cfg.password)
    if cfg.tls is not None:
        apply_tls(client, cfg.tls)
    client.will_set(will_topic, offline, qos=1, retain=True)
    # paho's reconnect backoff doubles from min to max; it takes ints, we allow sub-second
    client.reconnect_delay_set(cfg.reconnect_min_s, cfg.reconnect_max_s)  # type: ignore[arg-type]
    return client


def apply_tls(client: mqtt.Client, tls: MqttTlsSection) -> None:
    """``[mqtt.tls]`` on ``client``; a missing or unusable file is a ConfigError naming it."""
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(tls, name)
        if path is not None and not path.is_file():
            raise ConfigError(f"[mqtt.tls] {name} {path} does not exist or is not a file",
                              field=f"mqtt.tls.{name}")
    try:
        client.tls_set(ca_certs=str(tls.ca_file) if tls.ca_file else None,
                       certfile=str(tls.cert_file) if tls.cert_file else None,
                       keyfile=str(tls.key_file) if tls.key_file else None)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"[mqtt.tls] cannot be used: {exc}", field="mqtt.tls") from None
    client.tls_insecure_set(tls.insecure)


def describe_connect_error(exc: BaseException | None, backoff_max_s: float) -> str:
    """What an operator should read for a failed connect (socket or TLS handshake)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"TLS: the broker's certificate failed verification ({exc.verify_message}); "
                "check [mqtt.tls] ca_file (and insecure for a host name mismatch); retrying")
    if isinstance(exc, ssl.SSLError):
        return (f"TLS handshake failed ({exc.reason or exc}); check [mqtt.tls] cert_file, "
                "key_file and that the port is the broker's TLS listener; retrying")
    if isinstance(exc, ConnectionRefusedError):
        return (f"nothing accepts connections there; retrying with backoff (up to "
                f"{backoff_max_s:.1f}s), messages are buffered")
    return (f"broker unreachable ({exc}); retrying with backoff (up to {backoff_max_s:.1f}s), "
            "messages are buffered")


def describe_closed_early(detail: str, tls: bool) -> str:
    """The socket died before CONNACK: with TLS 1.3 a broker that wants a client certificate
    says so only after the handshake, as an alert on the first read."""
    hint = ("; check [mqtt.tls] cert_file/key_file: a broker with require_certificate "
            "needs a client certificate its CA signed" if "ssl" in detail.lower()
            or "alert" in detail.lower() else "")
    return (f"{'TLS: ' if tls else ''}connection closed before the broker accepted it "
            f"({detail}){hint}; retrying")
