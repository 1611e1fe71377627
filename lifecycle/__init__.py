"""Commands the chart runs as Helm hook Jobs around the services (not the services themselves), from the product
image.

- ``slime-certgen`` (:mod:`lifecycle.certgen`): makes the webhooks' certificates once and keeps them, so a
  chart rendered by ``helm template`` (Argo CD, Flux) holds no key and renders the same every time.
- ``slime-teardown`` (:mod:`lifecycle.teardown`): the pre-delete hook of ``helm uninstall``.
"""
