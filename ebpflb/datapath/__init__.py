"""The datapath adapter: the only package that talks to BCC and the bpf(2) syscall."""
