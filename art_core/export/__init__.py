"""Take a trained model anywhere: export a checkpoint as a PEFT adapter, a merged Hugging
Face model or a GGUF file (``export_checkpoint``; ``art-core export``; ``await
model.export(...)``)."""

from art_core.export.api import FORMATS, ExportFormat, ExportResult, export_checkpoint

__all__ = ["FORMATS", "ExportFormat", "ExportResult", "export_checkpoint"]
