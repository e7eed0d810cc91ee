"""Presigned upload URLs as S3 in each region accepts them: SigV4, on the bucket's regional host."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from pagescribe.aws import ObjectStore, s3_client


@pytest.mark.parametrize(
    ("region", "host"),
    [
        ("us-east-1", "pagescribe-docs-123.s3.amazonaws.com"),
        ("eu-west-1", "pagescribe-docs-123.s3.eu-west-1.amazonaws.com"),
        ("eu-central-1", "pagescribe-docs-123.s3.eu-central-1.amazonaws.com"),
        ("ap-southeast-2", "pagescribe-docs-123.s3.ap-southeast-2.amazonaws.com"),
    ],
)
def test_a_presigned_put_is_signed_with_sigv4_for_the_region_on_its_host(
    region: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the deployed function's environment in a region (no custom endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")

    # When an upload URL is made
    url = ObjectStore(s3_client()).presign_put(
        "pagescribe-docs-123", "uploads/doc/report.pdf", content_type="application/pdf", expires_in=900
    )

    # Then it is SigV4 (never SigV2's AWSAccessKeyId/Signature), scoped to the region, on the bucket's own host
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and "Signature" not in query
    assert f"/{region}/s3/aws4_request" in query["X-Amz-Credential"][0]
    assert "content-type" in query["X-Amz-SignedHeaders"][0]
    assert (parts.scheme, parts.netloc, parts.path) == ("https", host, "/uploads/doc/report.pdf")
