"""The REST API: FastAPI app served by uvicorn; it calls the engine and never imports DAG code."""
