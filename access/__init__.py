"""Users and permissions: who may send to, consume from and administer which topics.

``access.model`` holds the users, their permissions and the one decision
(``decide``); ``access.codec`` the document they are kept in; ``access.backends``
where it lives (a file in the data directory, or one object in the bucket a fleet
shares); ``access.directory`` the users a broker knows, kept fresh and changed by
conditional writes; ``access.principals`` who a call's credentials name, the single
``server.auth_token`` included.  The fronts (``chronomq.api.guard`` for the gRPC API)
enforce it; nothing here knows of gRPC.
"""
