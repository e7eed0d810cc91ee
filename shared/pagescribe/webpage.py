"""The review page's files (``shared/pagescribe/review/``) and the headers they are served with.

The page carries no data: it is served without an API key, and every data call it makes carries the key the user
types into it. Only the files named in ASSETS are served; any other name is not found. The Content-Security-Policy
lets the page run its own scripts and styles only, talk to the API (same origin) and to the documents bucket (the
presigned upload PUT and page image GET), and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

PAGE = "index.html"
# Name in the URL (/review/<name>) → (file under review/, Content-Type)
ASSETS: dict[str, tuple[str, str]] = {
    "review.js": ("review.js", "text/javascript; charset=utf-8"),
    "review.css": ("review.css", "text/css; charset=utf-8"),
    "purify.min.js": ("vendor/purify.min.js", "text/javascript; charset=utf-8"),
    "marked.umd.js": ("vendor/marked.umd.js", "text/javascript; charset=utf-8"),
}


@dataclass(frozen=True)
class Asset:
    body: str
    content_type: str
    cache_control: str


def page() -> Asset:
    """The HTML page: revalidated on every load, so that a new deployment's page and scripts arrive together."""
    return Asset(_read(PAGE), "text/html; charset=utf-8", "no-cache")


def asset(name: str) -> Asset | None:
    """A file of the allow-list by its name in the URL; None for any other name."""
    entry = ASSETS.get(name)
    if entry is None:
        return None
    return Asset(_read(entry[0]), entry[1], "public, max-age=300")


def _read(relative: str) -> str:
    return resources.files("pagescribe").joinpath("review", *relative.split("/")).read_text(encoding="utf-8")


def security_headers(bucket_origin: str) -> dict[str, str]:
    """The headers of every review response. ``bucket_origin`` is where presigned URLs point (the browser PUTs the
    upload there and shows page images from there)."""
    policy = "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            f"img-src 'self' {bucket_origin} blob: data:",
            f"connect-src 'self' {bucket_origin}",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }
