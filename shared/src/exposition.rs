//! What both processes' `/metrics` share (feature `metrics`): one registry that knows every series
//! name it can export, the text exposition, and `cp_build_info`.

use prometheus::core::Collector;
use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};

/// A registry and the names of everything registered in it.
#[derive(Debug)]
pub struct Exposition {
    registry: Registry,
    names: Vec<String>,
    histograms: &'static [&'static str],
}

impl Exposition {
    /// A registry whose histograms are `histograms`, with `cp_build_info{component,version,fips}`
    /// registered and set for `component` (returned to be kept in the metrics struct).
    pub fn new(
        histograms: &'static [&'static str],
        component: &str,
        fips: &str,
    ) -> Result<(Self, IntGaugeVec), prometheus::Error> {
        let mut exposition = Self {
            registry: Registry::new(),
            names: Vec::new(),
            histograms,
        };
        let build_info = IntGaugeVec::new(
            Opts::new("cp_build_info", "Build information."),
            &["component", "version", "fips"],
        )?;
        exposition.register(vec![Box::new(build_info.clone())])?;
        build_info
            .with_label_values(&[component, env!("CARGO_PKG_VERSION"), fips])
            .set(1);
        Ok((exposition, build_info))
    }

    /// Registers `collectors`, remembering their names.
    pub fn register(
        &mut self,
        collectors: Vec<Box<dyn Collector>>,
    ) -> Result<(), prometheus::Error> {
        for c in collectors {
            self.names
                .extend(c.desc().iter().map(|d| d.fq_name.clone()));
            self.registry.register(c)?;
        }
        Ok(())
    }

    /// Every series name this process can export (histograms with their `_bucket`, `_sum` and
    /// `_count` series), whether or not it has samples yet: dashboards and alerts are checked against it.
    pub fn metric_names(&self) -> Vec<String> {
        let mut out = self.names.clone();
        for h in self.histograms {
            for suffix in ["_bucket", "_sum", "_count"] {
                out.push(format!("{h}{suffix}"));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
