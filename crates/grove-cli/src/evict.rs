//! `grove evict`, `grove workspace restore|pin`, `grove release`, and the eviction order
//! shown by `grove workspace list`.

use anyhow::Result;
use grove_core::commands::ReleaseReport;
use grove_core::sweep::SweepReport;

pub fn print_report(report: &SweepReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{report:?}");
    }
    Ok(())
}

pub fn print_released(report: &ReleaseReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{report:?}");
    }
    Ok(())
}
