"""Where pagescribe keeps its state: the ports the use cases see (``ports``) and their PostgreSQL stores
(``postgres``)."""
