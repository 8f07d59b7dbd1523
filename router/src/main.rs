/// mimalloc gives freed memory back to the system within milliseconds; glibc's malloc keeps
/// what a burst of large requests (a `/tokenize` flood) freed in its per-thread arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(tandem_router::main_with_args(std::env::args().collect()));
}
