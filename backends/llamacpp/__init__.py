"""llama.cpp through llama-cpp-python: the backend, its executables, its worker process."""
