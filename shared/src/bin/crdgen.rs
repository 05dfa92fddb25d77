//! Writes the CRD YAML files into the directory given as the only argument (default `manifests/crds`).
#![forbid(unsafe_code)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "manifests/crds".into());
    std::fs::create_dir_all(&dir)?;
    for (file, yaml) in cp_api::crds::rendered()? {
        let path = std::path::Path::new(&dir).join(file);
        std::fs::write(&path, yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
