"""The entity vocabulary: what each row of the entity memory stands for, saved as JSON (never pickle).

Copied to the Hub as custom code with `modeling_edmem.py`; it imports nothing else of ours.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

ENTITY_VOCAB_NAME = "entity_vocab.json"
_FORMAT_VERSION = 1
# The id space of the authors' 1M-entity table (github DM2-ND/EDMem): row 0 means "no entity" in their labels,
# rows 1-9 are unused, entities start at row 10.
AUTHORS_ID_SPACE = "DM2-ND/EDMem"


class EntityVocab:
    """Entity id (a row of the entity table, `0..N-1`) -> canonical name, aliases and link count.

    Names are unique: they are what constrained decoding spells out between `<E_s>` and `<E_e>`. A row may have no
    name (`None`): a reserved row, or an entity whose name is not known (a converted checkpoint); it keeps its id and
    takes part in the memory, but is never spelled. `id_space` says whose ids these are when they are not ours
    (`AUTHORS_ID_SPACE` for a checkpoint converted from the authors': task files' entity ids then index it directly).
    """

    def __init__(
        self,
        names: Sequence[str | None],
        aliases: Sequence[Sequence[str]] | None = None,
        counts: Sequence[int] | None = None,
        id_space: str | None = None,
    ):
        names = list(names)
        if aliases is not None and len(aliases) != len(names):
            raise ValueError(f"EntityVocab: {len(aliases)} alias lists for {len(names)} names")
        if counts is not None and len(counts) != len(names):
            raise ValueError(f"EntityVocab: {len(counts)} counts for {len(names)} names")
        self.names = names
        self.aliases = [list(a) for a in aliases] if aliases is not None else [[] for _ in names]
        self.counts = list(map(int, counts)) if counts is not None else [0] * len(names)
        self.id_space = id_space
        self.num_unnamed = names.count(None)
        if not set(map(type, names)) <= {str, type(None)}:
            self._check_names()
        self._ids: dict[str, int] = dict(zip(names, range(len(names))))
        self._ids.pop(None, None)  # type: ignore[call-overload]
        if len(self._ids) != len(names) - self.num_unnamed or "" in self._ids:
            self._check_names()

    def _check_names(self) -> None:
        """Raises a ValueError naming the first bad name (the constructor's checks, one name at a time)."""
        seen: dict[str, int] = {}
        for i, name in enumerate(self.names):
            if name is None:
                continue
            if not isinstance(name, str) or not name:
                raise ValueError(f"EntityVocab: entity {i} has an empty or non-string name: {name!r}")
            if name in seen:
                raise ValueError(f"EntityVocab: duplicate entity name {name!r} (ids {seen[name]} and {i})")
            seen[name] = i

    @classmethod
    def from_names(cls, names: Iterable[str]) -> EntityVocab:
        return cls(list(names))

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    def __repr__(self) -> str:
        head = ", ".join(repr(n) for n in self.names[:3])
        unnamed = f", {self.num_unnamed} unnamed" if self.num_unnamed else ""
        return f"EntityVocab({len(self)} entities{unnamed}: {head}{', ...' if len(self) > 3 else ''})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, EntityVocab)
            and self.names == other.names
            and self.aliases == other.aliases
            and self.counts == other.counts
            and self.id_space == other.id_space
        )

    def id_of(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(f"unknown entity name {name!r}") from None

    def name_of(self, entity_id: int) -> str:
        entity_id = int(entity_id)
        if not 0 <= entity_id < len(self.names):
            raise ValueError(f"unknown entity id {entity_id}: the vocabulary has ids 0..{len(self.names) - 1}")
        name = self.names[entity_id]
        if name is None:
            raise ValueError(f"entity id {entity_id} has no name (a reserved or unnamed row of the table)")
        return name

    # --- files -------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        data = {"format_version": _FORMAT_VERSION, "names": self.names, "aliases": self.aliases, "counts": self.counts}
        if self.id_space is not None:
            data["id_space"] = self.id_space
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EntityVocab:
        if not isinstance(data, dict) or "names" not in data:
            raise ValueError("not an EDMem entity vocabulary: expected a JSON object with a 'names' list")
        version = data.get("format_version", _FORMAT_VERSION)
        if version > _FORMAT_VERSION:
            raise ValueError(f"entity vocabulary format {version} is newer than this code reads ({_FORMAT_VERSION})")
        return cls(data["names"], data.get("aliases"), data.get("counts"), data.get("id_space"))

    def save(self, path: str | os.PathLike) -> str:
        """Writes `entity_vocab.json` into a directory (or to a file path ending in .json)."""
        path = os.fspath(path)
        if not path.endswith(".json"):
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, ENTITY_VOCAB_NAME)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), ensure_ascii=False))  # dumps uses the C encoder; dump does not
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> EntityVocab:
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, ENTITY_VOCAB_NAME)
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} is not valid JSON: {err}") from err
        return cls.from_dict(data)
