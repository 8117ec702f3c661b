"""The SGLang servers the exporter polls: their base URLs, their `server` label, and the list
/sd/sglang serves.

A server is named host:port of its base URL, the `instance` Prometheus gives it in the
`sglang` scrape job; that job discovers its targets from /sd/sglang, so the URLs are configured
once (in the exporter) and the exporter's series join SGLang's own on that label.
"""

from __future__ import annotations

import json
import urllib.parse

from sglang_obs.core import shown


def base_url(text: str) -> str:
    """A server's base URL without its trailing '/'; ValueError unless http(s) with a host and
    no credentials, query or fragment in it (they would show on the landing page, the glance
    page and in /sd/sglang: SGLang's API key goes in --sglang.api-key-file). The message shows
    the URL through shown.url, without them."""
    try:
        shown.plain_url(text)
    except ValueError as err:
        raise ValueError(f"{err}; give SGLang's API key with --sglang.api-key-file "
                         "instead") from None
    server_label(text)
    return text.rstrip("/")


def server_label(url: str) -> str:
    """host:port of a base URL — the `instance` the SGLang scrape job gives the same server."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"not an http(s) URL: {shown.url(url)!r}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{port}"


def service_discovery(urls: list[str]) -> bytes:
    """HTTP SD answer: one target group per server; the scheme travels as __scheme__."""
    groups = []
    for url in urls:
        # Same host:port as the exporter's `server` label, so the two jobs join on instance.
        scheme = url.partition("://")[0]
        groups.append({"targets": [server_label(url)], "labels": {"__scheme__": scheme}})
    return json.dumps(groups).encode()
