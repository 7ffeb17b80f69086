use pgrx::prelude::*;
