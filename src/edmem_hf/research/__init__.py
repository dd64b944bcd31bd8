"""The research wing: what the measurements of docs/evidence.md train and ask, beside the model a user loads.

- `writer_training`: the options of training the writer of entity rows (`WriterTrainingArguments`, named recipes)
  and what `edmem pretrain` does with them; `writer_batches`: the batches that read written rows.
- `entity_growth`: new entities written into a trained model's memory (`add_entities`); `new_entity_text`: their
  texts from a MediaWiki dump; `row_fitting`: rows trained by gradient; `add_entities_command`: `edmem add-entities`.
- `example_mixing`: questions and balanced entities mixed into pre-training's batches (the experiments' levers).
- `diagnostics`: where a model keeps what it knows of an entity (row swap, oracle read, rewrite, row content).

None of it is Hub custom code: a saved model reads its memory (and the rows kept beside its table) without it.
"""
