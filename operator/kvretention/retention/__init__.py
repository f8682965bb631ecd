"""Retention that takes effect: the SGLang plugin that applies ``kv.retain`` in the engine.

This module stays import-light (no SGLang, no torch): the operator and the probe read its names.
The plugin itself (``plugin.register``) is loaded by SGLang's own plugin framework through the
``sglang.srt.plugins`` entry point.
"""

from __future__ import annotations

PLUGIN_NAME = "kvretention"
"""The entry-point name in ``sglang.srt.plugins`` (what ``SGLANG_PLUGINS`` selects)."""

EVICTION_POLICY = "kvretain"
"""The ``--radix-eviction-policy`` the plugin adds: retained and unexpired nodes are evicted last."""

HOLD_UNTIL_ATTR = "kvr_hold_until"
"""Attribute the plugin sets on a radix ``TreeNode``: expiry of its hold by the plugin's monotonic
clock (``radix.clock``, ``time.monotonic()``), or ``None`` for a hold that never expires; absent on
nodes no directive covers."""
