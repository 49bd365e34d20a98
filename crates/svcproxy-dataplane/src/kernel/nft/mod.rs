//! nftables tables as the modes that keep one write and probe them: the nftables
//! and userspace modes' `ip`/`ip6 svcproxy` tables, and the eBPF mode's fixed
//! companion table.
//!
//! - [`sink`]: where a plan goes ([`ScriptSink`]): the real `nft`
//!   ([`NftCommand`]), whose typed plans go over netlink instead, or a recorder
//!   in tests ([`RecordingSink`]);
//! - [`netlink`]: one nf_tables batch per sync ([`BatchBuilder`],
//!   [`NetlinkWriter`]);
//! - [`table`]: a table's state and a chain's existence, asked over netlink (the
//!   drift checks).

pub mod netlink;
pub mod sink;
pub mod table;

pub use netlink::{Batch, BatchBuilder, BatchStats, NetlinkWriter};
pub use sink::{NftCommand, RecordingSink, ScriptSink};
pub use table::{chain_exists, chain_use, inet_table_state, table_state, TableState};
