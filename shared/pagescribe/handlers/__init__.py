"""The Lambda handlers, one module per function. Each ``functions/<name>/app.py`` is that function's entry point
for Lambda (``Handler: app.handler``) and takes its handler from here; the CLI's local stack imports the same
modules, so an installed ``pagescribe`` runs exactly what Lambda runs."""
