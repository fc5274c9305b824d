"""The one name for a decoded JSON object (a Kubernetes object as the REST client returns it).

Kept in a module of its own, with no imports beyond `typing`, so any module may take it without
paying for pydantic or the REST client.
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]
