"""Ground floor: plotly figures from arrays and labels, and self-contained HTML pages. It knows no result
type: each result's ``.plot()`` calls down to these functions (imported lazily by callers)."""
