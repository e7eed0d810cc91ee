"""Escalation across providers: each model asked on the provider that serves it (ESCALATION_PROVIDER).

MODEL (and every other model a caller may name) goes to PROVIDER's provider, ESCALATION_MODEL to
ESCALATION_PROVIDER's: e.g. pages on Bedrock, a hard page escalated to a model on the OpenAI-compatible endpoint, or
the reverse. The ledger records the provider that served each call (:meth:`RoutingProvider.serving`), and the rate
governor's buckets are per provider and model.
"""

from __future__ import annotations

from pagescribe.providers.base import Transcription, TranscriptionProvider, TranscriptionRequest


class RoutingProvider:
    """``primary`` for every model but those of ``routes``, each asked on its own provider."""

    def __init__(self, primary: TranscriptionProvider, routes: dict[str, TranscriptionProvider]) -> None:
        self._primary = primary
        self._routes = routes
        names = [primary.name] + [p.name for p in routes.values() if p.name != primary.name]
        self._name = "+".join(dict.fromkeys(names))

    def __repr__(self) -> str:
        return f"RoutingProvider(primary={self._primary!r}, routes={self._routes!r})"

    @property
    def name(self) -> str:
        return self._name

    def answering_model(self, requested: str) -> str:
        return self._route(requested).answering_model(requested)

    def serving(self, model: str) -> str:
        return self._route(model).name

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        return await self._route(request.model).transcribe(request, call_seconds=call_seconds)

    async def aclose(self) -> None:
        for provider in {id(p): p for p in (self._primary, *self._routes.values())}.values():
            await provider.aclose()

    def _route(self, model: str) -> TranscriptionProvider:
        return self._routes.get(model, self._primary)
