"""The one health probe of an HTTP service (MLflow, Prefect, the stack's parts)."""

from __future__ import annotations

import base64
import urllib.error
import urllib.parse
import urllib.request

DEFAULT_TIMEOUT_S = 5.0


def http_problem(
    url: str, timeout: float = DEFAULT_TIMEOUT_S, auth_counts_as_up: bool = False
) -> str | None:
    """GET ``url``: None when it answers 200, else why not, in a few words.

    Credentials in the URL (``user:pass@``) are sent as basic auth, never as part of the URL.
    ``auth_counts_as_up``: a 401/403 means the server runs (its real clients carry credentials).
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host  # IPv6 literal
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    request = urllib.request.Request(bare)
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        token = f"{user}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        if auth_counts_as_up and exc.code in (401, 403):
            return None
        return f"GET {parts.path or '/'} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))
    return None if status == 200 else f"GET {parts.path or '/'} answered HTTP {status}"


def health_url(base: str, path: str = "/health") -> str:
    """``base`` with ``path`` appended (no double slash)."""
    return base.rstrip("/") + path
