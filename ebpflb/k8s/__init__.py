"""Objects in: the Kubernetes side of the flow. sources/ deliver Services and
EndpointSlices (the API server's list and watch, manifest files), fields.py reads their
JSON strictly, translate.py turns them into model values, trackers.py keeps the current
picture and what changed since the last sync. Nothing here touches the datapath."""
