"""`probe ui`: a live dashboard of every rank, served from the operator's side.

``snapshot`` gathers (one fan-out per refresh, the same diagnose/ verdicts the commands print),
``server`` serves the page and its JSON from a stdlib ThreadingHTTPServer, ``static/`` holds
the page (no CDN: everything ships in the wheel).
"""
