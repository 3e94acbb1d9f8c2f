"""Names of study attributes that readers read back without importing the study machinery (which imports torch)."""

QUALITY_NOTE = "quality_note"  # why the study's quality numbers mean nothing ("" when they do), written when it is created
