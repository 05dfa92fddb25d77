//! Reading the measured processes' metrics (Prometheus text exposition).

use anyhow::Context;

/// Sum of every sample of the series `name` (any labels) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `/metrics` of the process serving it on `addr` (plain HTTP); `what` names it in errors.
pub async fn scrape(addr: &str, what: &str) -> anyhow::Result<String> {
    let (code, body) = cp_tests::webhook::http_get(addr, "/metrics")
        .await
        .with_context(|| format!("reading the {what}'s metrics"))?;
    anyhow::ensure!(code == 200, "{what} /metrics answered {code}");
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn a_series_is_summed_over_its_labels_and_only_it() {
        let text =
            "# HELP x_total x\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3.5\nx_total_more 9\nx 1\n";
        assert_eq!(metric_sum(text, "x_total"), 5.5);
        assert_eq!(metric_sum(text, "x"), 1.0);
        assert_eq!(metric_sum(text, "y"), 0.0);
    }
}
