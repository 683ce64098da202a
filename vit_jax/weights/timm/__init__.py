"""timm's model families both ways, numpy only (no torch): the registry of families
(`families.py`: one `TimmFamily` record each), one module per family's table of arrays
(`vit.py`, `eva.py`, `naflex.py`, `mixer.py`, `bit.py`) with what its constructor arguments
mean for our settings (`vit_config.py`, `eva_config.py`), what the readers share
(`arguments.py`) and the ViT and Eva tables share (`shared_rows.py`), timm's architecture
names (`names.py`), a checkpoint's folder both ways (`folder.py`) and a config from a name
alone (`create.py`)."""
