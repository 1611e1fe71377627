"""The release's lifecycle in the cluster: what the chart's hook Jobs run from the product image.

``slime-certgen`` (:mod:`lifecycle.certgen`) makes the webhooks' certificates once and keeps them,
so a chart rendered by ``helm template`` (Argo CD, Flux) holds no key and renders the same every time.
"""
