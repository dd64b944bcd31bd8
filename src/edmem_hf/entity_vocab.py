"""The entity vocabulary: what each row of the entity memory stands for, saved as JSON (never pickle).

Copied to the Hub as custom code with `modeling_edmem.py`; it imports nothing else of ours.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

ENTITY_VOCAB_NAME = "entity_vocab.json"
_FORMAT_VERSION = 1
# Whose ids the rows of a vocabulary are (`entity_vocab.json`'s "id_space"):
# - ours: rows 0..N-1, every one an entity (row 0 is an entity like any other); "no entity" is -100, never a row;
OWN_ID_SPACE = "edmem-hf"
# - the authors' 1M-entity table (github DM2-ND/EDMem): row 0 means "no entity" in their labels, rows 1-9 are
#   unused, entities start at row 10 (the ids of their released task files).
AUTHORS_ID_SPACE = "DM2-ND/EDMem"
AUTHORS_NO_ENTITY, AUTHORS_FIRST_ENTITY = 0, 10
ID_SPACES = (OWN_ID_SPACE, AUTHORS_ID_SPACE)


class EntityVocab:
    """Entity id (a row of the entity table, `0..N-1`) -> canonical name, aliases and link count.

    Names are unique: they are what constrained decoding spells out between `<E_s>` and `<E_e>`. A row may have no
    name (`None`): a reserved row, or an entity whose name is not known (a converted checkpoint); it keeps its id and
    takes part in the memory, but is never spelled.

    `id_space` says whose ids the rows are, and is saved: `OWN_ID_SPACE` (ours: every row an entity, "no entity" is
    -100) or `AUTHORS_ID_SPACE` (a checkpoint converted from the authors': their row 0 means "no entity" and rows 0-9
    are never named; their task files' entity ids index it directly). A vocabulary of our own made from the authors'
    files may keep `authors_ids`, each row's id in theirs (None for an entity they do not have), so that their files'
    ids map to its rows (`from_authors_id`).
    """

    def __init__(
        self,
        names: Sequence[str | None],
        aliases: Sequence[Sequence[str]] | None = None,
        counts: Sequence[int] | None = None,
        id_space: str | None = OWN_ID_SPACE,
        authors_ids: Sequence[int | None] | None = None,
    ):
        names = list(names)
        if aliases is not None and len(aliases) != len(names):
            raise ValueError(f"EntityVocab: {len(aliases)} alias lists for {len(names)} names")
        if counts is not None and len(counts) != len(names):
            raise ValueError(f"EntityVocab: {len(counts)} counts for {len(names)} names")
        self.names = names
        self.aliases = [list(a) for a in aliases] if aliases is not None else [[] for _ in names]
        self.counts = list(map(int, counts)) if counts is not None else [0] * len(names)
        self.id_space = OWN_ID_SPACE if id_space is None else id_space
        self.authors_ids = None if authors_ids is None else [None if i is None else int(i) for i in authors_ids]
        self._check_id_space()
        self.num_unnamed = names.count(None)
        if not set(map(type, names)) <= {str, type(None)}:
            self._check_names()
        self._ids: dict[str, int] = dict(zip(names, range(len(names))))
        self._ids.pop(None, None)  # type: ignore[call-overload]
        if len(self._ids) != len(names) - self.num_unnamed or "" in self._ids:
            self._check_names()

    def _check_id_space(self) -> None:
        """Raises a ValueError when the ids do not say whose they are, or a row that means "no entity" is one."""
        if self.id_space not in ID_SPACES:
            raise ValueError(f"EntityVocab: unknown id_space {self.id_space!r} (one of {', '.join(ID_SPACES)})")
        if self.id_space == AUTHORS_ID_SPACE:
            named = [i for i, name in enumerate(self.names[:AUTHORS_FIRST_ENTITY]) if name is not None]
            if named:
                raise ValueError(
                    f"EntityVocab: row {named[0]} is named {self.names[named[0]]!r}, but in the authors' ids rows "
                    f"0..{AUTHORS_FIRST_ENTITY - 1} are not entities (0 means none)"
                )
            if self.authors_ids is not None:
                raise ValueError(
                    "EntityVocab: authors_ids maps the rows of a vocabulary of our own to the authors' ids"
                )
        if self.authors_ids is None:
            return
        if len(self.authors_ids) != len(self.names):
            raise ValueError(f"EntityVocab: {len(self.authors_ids)} authors' ids for {len(self.names)} names")
        self._by_authors_id: dict[int, int] = {}
        for row, authors_id in enumerate(self.authors_ids):
            if authors_id is None:
                continue
            if authors_id < AUTHORS_FIRST_ENTITY:
                raise ValueError(
                    f"EntityVocab: entity {row} has the authors' id {authors_id}, which is not an entity in their ids "
                    f"(entities start at {AUTHORS_FIRST_ENTITY}; {AUTHORS_NO_ENTITY} means none)"
                )
            if self._by_authors_id.setdefault(authors_id, row) != row:
                raise ValueError(
                    f"EntityVocab: entities {self._by_authors_id[authors_id]} and {row} have the same authors' id "
                    f"{authors_id}"
                )

    def from_authors_id(self, authors_id: int) -> int | None:
        """This vocabulary's id of the entity the authors' files give as `authors_id` (their ids: entities from 10,
        0 = none), or None when the vocabulary does not hold it (and always for their "none")."""
        authors_id = int(authors_id)
        if authors_id < AUTHORS_FIRST_ENTITY:
            return None
        if self.id_space == AUTHORS_ID_SPACE:
            return authors_id if authors_id < len(self.names) else None
        return None if self.authors_ids is None else self._by_authors_id.get(authors_id)

    def extended(self, names: Sequence[str], aliases: Sequence[Sequence[str]] | None = None) -> EntityVocab:
        """This vocabulary with entities `names` appended (new rows, with `aliases` or none, without links or an id of
        the authors')."""
        if aliases is not None and len(aliases) != len(names):
            raise ValueError(f"EntityVocab.extended: {len(aliases)} alias lists for {len(names)} names")
        return type(self)(
            self.names + list(names),
            self.aliases + ([list(a) for a in aliases] if aliases is not None else [[] for _ in names]),
            self.counts + [0 for _ in names],
            self.id_space,
            None if self.authors_ids is None else self.authors_ids + [None for _ in names],
        )

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
            and self.authors_ids == other.authors_ids
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
        data = {"format_version": _FORMAT_VERSION, "id_space": self.id_space, "names": self.names}
        data |= {"aliases": self.aliases, "counts": self.counts}
        if self.authors_ids is not None:
            data["authors_ids"] = self.authors_ids
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EntityVocab:
        if not isinstance(data, dict) or "names" not in data:
            raise ValueError("not an EDMem entity vocabulary: expected a JSON object with a 'names' list")
        version = data.get("format_version", _FORMAT_VERSION)
        if version > _FORMAT_VERSION:
            raise ValueError(f"entity vocabulary format {version} is newer than this code reads ({_FORMAT_VERSION})")
        # a file without "id_space" predates it: ids of our own were the only ones not named
        return cls(
            data["names"], data.get("aliases"), data.get("counts"), data.get("id_space"), data.get("authors_ids")
        )

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
