"""Checks of a batch's mention markers and entity labels, with errors that say which row and position is wrong
(`modeling_edmem`'s forward passes run them). Copied to the Hub as custom code with `modeling_edmem.py`."""

from __future__ import annotations

import torch

from .configuration_edmem import IGNORE_INDEX, EDMemConfig


def check_mention_markers(input_ids: torch.Tensor, config: EDMemConfig, what: str = "input_ids") -> None:
    """Raises a ValueError when `<E_s>` and `<E_e>` do not pair up (no nesting, none left open) in every row."""
    start = input_ids == config.entity_start_token_id
    end = input_ids == config.entity_end_token_id
    depth = torch.cumsum(start.long() - end.long(), dim=-1)
    bad_rows = ((depth < 0) | (depth > 1)).any(dim=-1) | (depth[..., -1] != 0)
    if bad_rows.any():
        row = int(bad_rows.nonzero()[0, 0])
        raise ValueError(
            f"unmatched mention markers in {what} row {row}: every <E_s> (id {config.entity_start_token_id}) must be "
            f"closed by an <E_e> (id {config.entity_end_token_id}) before the next <E_s> or the end of the sequence"
        )


def check_entity_labels(
    entity_labels: torch.Tensor, token_ids: torch.Tensor, config: EDMemConfig, what: str = "entity_labels"
) -> None:
    """Raises a ValueError for labels off `<E_s>` positions or outside the entity vocabulary."""
    if entity_labels.shape != token_ids.shape:
        raise ValueError(
            f"{what} has shape {tuple(entity_labels.shape)} but the tokens it labels have shape {tuple(token_ids.shape)}"
        )
    labelled = entity_labels != IGNORE_INDEX
    off_marker = labelled & (token_ids != config.entity_start_token_id)
    if off_marker.any():
        row, pos = off_marker.nonzero()[0].tolist()
        raise ValueError(
            f"{what} puts entity {int(entity_labels[row, pos])} on row {row} position {pos}, which is token "
            f"{int(token_ids[row, pos])}, not <E_s> (id {config.entity_start_token_id}); use -100 for no label"
        )
    out_of_vocab = labelled & ((entity_labels < 0) | (entity_labels >= config.entity_vocab_size))
    if out_of_vocab.any():
        row, pos = out_of_vocab.nonzero()[0].tolist()
        raise ValueError(
            f"unknown entity id {int(entity_labels[row, pos])} in {what} (row {row}, position {pos}): the entity "
            f"vocabulary has ids 0..{config.entity_vocab_size - 1}"
        )


__all__ = ["check_entity_labels", "check_mention_markers"]
