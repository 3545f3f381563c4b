"""The certificate ``OTEL_EXPORTER_OTLP_*CERTIFICATE`` names, kept by the OTLP/HTTP exporters.

The stock HTTP exporters set the certificate on a ``requests.Session`` (``session.verify``).
But ``requests`` lets ``REQUESTS_CA_BUNDLE`` and ``CURL_CA_BUNDLE`` override a session's
``verify`` on every request, and those are set on many machines (conda, corporate images,
this CI's): the collector's certificate is then silently ignored and every export fails
with ``CERTIFICATE_VERIFY_FAILED``. Where a certificate is configured, the exporters get a
session whose own ``verify`` wins; proxies and the rest still come from the environment.
"""

from __future__ import annotations

import os
from typing import Any


def certificate_session(signal: str) -> Any:
    """A ``requests.Session`` for ``traces`` or ``metrics``, or None where no certificate is set."""
    path = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_CERTIFICATE")
            or os.environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE"))
    if not path:
        return None
    import requests

    class _KeepsItsCertificate(requests.Session):
        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                       cert: Any) -> dict[str, Any]:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            settings["verify"] = self.verify
            return settings

    session = _KeepsItsCertificate()
    session.verify = path
    return session
