fn main() {
    std::process::exit(tandem_router::main_with_args(std::env::args().collect()));
}
