"""The inference servers simpipe runs itself: llama.cpp's HTTP server, the stub and the GPU
emulator, and the launcher they share.
"""
