"""The web dashboard: server-rendered pages (Jinja2 + inline SVG charts, no JavaScript,
no build step) served by the control plane at `/`."""
