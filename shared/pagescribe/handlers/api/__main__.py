"""Print the API's OpenAPI document: ``python -m pagescribe.handlers.api > docs/openapi.json``."""

from pagescribe.handlers.api.routes import openapi_json

print(openapi_json())
