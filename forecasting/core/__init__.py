"""Pure forecasting core: demand series, forecast models, backtests, runtime predictor.

No Django, DRF or Celery here (an import-linter contract enforces it).  Prophet is
imported lazily, only where a model is fitted.  See docs/forecasting.md.
"""
