//! `make manifests`: writes every generated manifest under the directory given as the only argument
//! (default `manifests`).
#![forbid(unsafe_code)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "manifests".into()),
    );
    for (rel, content) in cp_api::bundle::generated(&dir)? {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
