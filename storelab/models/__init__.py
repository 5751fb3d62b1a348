"""Models as data (``config``), built and run (``model``), and accounted without weights (``accounting``)."""

from storelab.models.config import LayerConfig, ModelConfig, Published, load_model

__all__ = ["LayerConfig", "ModelConfig", "Published", "load_model"]
