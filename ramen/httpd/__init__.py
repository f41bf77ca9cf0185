"""`ramen httpd`: dashboards over HTTP. The Graphite API that Grafana's Graphite data source speaks
(graphite_api: /render, /metrics/find, /functions), Prometheus metrics (/metrics), and ramen's own
dashboard page (/). Every render is a replay through ramen.replay.client, so a dashboard's panels
refreshing at once meet in the supervisor's merge and read the archive once."""
