//! `grove workspace merge-back` and `grove workspace merge-back-diff`: bringing a task
//! workspace's commits into an edit workspace, and reading first what that would bring.

use std::process::ExitCode;

use anyhow::Result;
use grove_core::commands::{Command, MergeBack};
use grove_core::merge_back::{MergeBackDiff, MergeBackReport, MergeStrategy};
use uuid::Uuid;

use crate::{client, connect, parse_id, print_result};

/// `grove workspace merge-back EDIT_ID --task TASK_ID --strategy merge|cherry-pick`.
pub async fn merge_back(
    edit: String,
    task: String,
    strategy: String,
    command_id: Option<Uuid>,
    json: bool,
) -> Result<ExitCode> {
    let command = Command::MergeBack(MergeBack {
        edit_workspace_id: parse_id(&edit)?,
        task_workspace_id: parse_id(&task)?,
        strategy: MergeStrategy::parse(&strategy)?,
    });
    command.validate()?;
    let pool = connect(4).await?;
    let result = client::submit(&pool, &command, command_id, None).await?;
    print_result(&result, json)
}

/// `grove workspace merge-back-diff EDIT_ID --task TASK_ID`.
pub async fn diff(edit: String, task: String, json: bool) -> Result<ExitCode> {
    let command = Command::MergeBackDiff {
        edit_workspace_id: parse_id(&edit)?,
        task_workspace_id: parse_id(&task)?,
    };
    command.validate()?;
    let pool = connect(4).await?;
    let result = client::submit(&pool, &command, None, None).await?;
    print_result(&result, json)
}

pub fn print_diff(d: &MergeBackDiff, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(d)?);
        return Ok(());
    }
    let short = |id: &str| id.chars().take(12).collect::<String>();
    println!(
        "{} ({}) <- {} ({}), merge base {}",
        d.edit_branch,
        short(&d.edit_head),
        d.task_branch,
        short(&d.task_head),
        d.merge_base
            .as_deref()
            .map(short)
            .unwrap_or_else(|| "none".into())
    );
    if d.up_to_date {
        println!("up to date: the task has no commit the target lacks");
    }
    for c in &d.commits {
        println!("commit {} {}", short(&c.id), c.summary);
    }
    if d.commits_total > d.commits.len() {
        println!("... {} more commits", d.commits_total - d.commits.len());
    }
    for f in &d.files {
        let renamed = f
            .old_path
            .as_deref()
            .map(|o| format!(" (from {o})"))
            .unwrap_or_default();
        let stats = if f.binary {
            "binary".to_string()
        } else {
            format!("+{} -{}", f.insertions, f.deletions)
        };
        println!("{:<10} {}{}  {}", f.status, f.path, renamed, stats);
    }
    if d.files_total > d.files.len() {
        println!("... {} more files", d.files_total - d.files.len());
    }
    println!(
        "{} commits, {} files, +{} -{}{}{}",
        d.commits_total,
        d.files_total,
        d.insertions,
        d.deletions,
        if d.fast_forward { ", fast-forward" } else { "" },
        if d.task_dirty {
            "; the task has uncommitted changes, which are not merged back"
        } else {
            ""
        }
    );
    Ok(())
}

pub fn print_report(r: &MergeBackReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    if r.previous_head == r.new_head {
        println!("up to date: {} stays at {}", r.edit_branch, r.previous_head);
        return Ok(());
    }
    let how = match (r.strategy, r.fast_forward) {
        (MergeStrategy::Merge, true) => "fast-forward".to_string(),
        (MergeStrategy::Merge, false) => "merge commit".to_string(),
        (MergeStrategy::CherryPick, _) => format!(
            "{} cherry-picked, {} skipped",
            r.created.len(),
            r.skipped.len()
        ),
    };
    println!(
        "{} {} -> {} ({how}; {} task commits, {} files)",
        r.edit_branch,
        r.previous_head,
        r.new_head,
        r.commits.len(),
        r.files.len()
    );
    Ok(())
}
