"""Spend reports: month-to-date and forecast per team against budget, and the
per-segment export in FOCUS column names (CSV/JSON) behind `autoscaler spend`."""
