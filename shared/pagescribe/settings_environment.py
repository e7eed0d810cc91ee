"""The settings' environment source, cheaper at cold start than pydantic-settings' own for settings of scalars."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, PydanticBaseSettingsSource


def _is_scalar(annotation: Any) -> bool:
    """str, int, float, bool, SecretStr, a Literal of strings, or a union of these (with None)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return all(isinstance(arg, str) for arg in get_args(annotation))
    if origin is Union or origin is types.UnionType:
        return all(_is_scalar(arg) for arg in get_args(annotation))
    return annotation in (str, int, float, bool, SecretStr, type(None))


class ScalarEnvironment(PydanticBaseSettingsSource):
    """The environment source, for settings whose fields are all scalars: each field's variable as the string it
    is, for pydantic to validate; the values pydantic-settings' own source gives for such fields.

    That source first asks of every field's type whether it is a container to decode from JSON, by ``issubclass``
    against ``Mapping``, ``Sequence``, ``Set`` and ``BaseModel``, and Python caches each negative answer in every
    subclass of those classes. At cold start, with boto3, SQLAlchemy and Powertools loaded, that is about 2,600
    long-lived objects and several milliseconds: enough to set off one more full garbage collection (some 50 ms
    in the migrate function)."""

    def __init__(self, environment: EnvSettingsSource) -> None:
        super().__init__(environment.settings_cls)
        self._environment = environment

    @classmethod
    def replacing(cls, source: PydanticBaseSettingsSource) -> PydanticBaseSettingsSource:
        """This source in place of pydantic-settings' environment source where it gives the same values."""
        if (
            type(source) is not EnvSettingsSource
            or source.env_parse_none_str is not None
            or source.env_parse_enums
            or not all(
                _is_scalar(field.annotation) and field.alias is None and field.validation_alias is None
                for field in source.settings_cls.model_fields.values()
            )
        ):
            return source
        return cls(source)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        environment = self._environment
        name = environment.env_prefix + field_name
        return environment.env_vars.get(name if environment.case_sensitive else name.lower()), field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {name: self.get_field_value(field, name)[0] for name, field in self.settings_cls.model_fields.items()}
        return {name: value for name, value in values.items() if value is not None}
