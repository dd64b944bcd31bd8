"""What `finetune_qa.py` and `finetune_generation.py` share, now installed as `edmem_hf.finetuning` (the `edmem
finetune` command): its `Task`, `run` and `parse_arguments`, for scripts that define a task of their own.

    from finetune_common import Task, run  # or: from edmem_hf.finetuning import Task, run
"""

from edmem_hf.finetuning import (  # noqa: F401
    PAPER_DEFAULTS,
    DataArguments,
    ModelArguments,
    Task,
    decode,
    parse_arguments,
    run,
)
