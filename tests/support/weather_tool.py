"""The ``get_weather`` tool the data-plane tests call: its JSON Schema, which every provider's
shape wraps, and the worker's own shape (a ``/v1/generate`` body's ``tools`` item)."""

from __future__ import annotations

from typing import Any, Final

CITY_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER: Final[dict[str, Any]] = {"name": "get_weather", "parameters": CITY_SCHEMA}
"""As the worker receives it."""
