fn main() {
    println!("{}", kv_indexer::version());
}
