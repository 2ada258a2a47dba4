"""Layer ids of captured hidden states: id k = residual stream after k decoder layers.

Id N (the number of decoder layers) is the last layer's output before the final norm, the
teacher of the drafter. Kept free of heavy imports: the Snakefile resolves ids at DAG time.
"""

from __future__ import annotations

from collections.abc import Sequence

from eagleflow.logs import InputError


def default_layer_ids(num_layers: int) -> tuple[list[int], int]:
    """The usual EAGLE-3 aux ids (2, N//2, N-3) and the teacher's id N, for N decoder layers."""
    return [2, num_layers // 2, num_layers - 3], num_layers


def check_layer_ids(ids: Sequence[int], num_layers: int) -> None:
    """Raise InputError naming the first bad id: ids must be distinct integers in [1, N].

    vLLM silently drops duplicate ids (and then fails far away), so they are refused here.
    """
    seen: set[int] = set()
    for layer_id in ids:
        if isinstance(layer_id, bool) or not hasattr(layer_id, "__index__"):
            raise InputError(f"layer id {layer_id!r} is not an integer (ids: {list(ids)})")
        if not 1 <= layer_id <= num_layers:
            raise InputError(
                f"layer id {layer_id} is out of range: ids must lie in [1, {num_layers}] for a "
                f"target with {num_layers} decoder layers (ids: {list(ids)})"
            )
        if layer_id in seen:
            raise InputError(f"layer id {layer_id} appears more than once (ids: {list(ids)})")
        seen.add(int(layer_id))


def resolve_aux_layer_ids(configured: Sequence[int] | None, num_layers: int) -> list[int]:
    """The configured aux ids, or the defaults, checked together with the last id N."""
    aux_ids, last_id = default_layer_ids(num_layers)
    aux_ids = list(configured) if configured else aux_ids
    try:
        check_layer_ids([*aux_ids, last_id], num_layers)
    except InputError as err:
        raise InputError(f"extract.aux_layer_ids: {err}") from None
    return aux_ids
