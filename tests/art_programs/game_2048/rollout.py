import math
import random

import art
import openai
import weave
from game import SYSTEM_PROMPT, WINNING_VALUE, apply_move, finished, max_tile, new_game, render


@weave.op
@art.retry(exceptions=(openai.APIConnectionError,))
async def rollout(model: art.Model, step: int, is_validation: bool) -> art.Trajectory:
    game = new_game(random.Random())
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": SYSTEM_PROMPT}],
        metadata={"game_id": game["id"], "step": step, "validation": is_validation},
        reward=0,
    )
    moves = 0
    while True:
        trajectory.messages_and_choices.append({"role": "user", "content": render(game)})
        client = model.openai_client()
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            max_completion_tokens=16,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)  # the raw Choice, as ART's examples do
        try:
            apply_move(game, choice.message.content or "")
            moves += 1
        except ValueError:
            trajectory.reward = -1 + 0.1 * moves  # an invalid move ends the game
            break
        if finished(game) or moves >= 8:
            best, total = max_tile(game), sum(map(sum, game["board"]))
            trajectory.metrics["max_value"] = best
            trajectory.metrics["board_value"] = total
            trajectory.metrics["moves"] = moves
            if best >= WINNING_VALUE:
                trajectory.reward = 2
            else:  # the biggest tile counts most, the board's total a little
                win = math.log2(WINNING_VALUE)
                trajectory.reward = (math.log2(best) + 0.1 * math.log2(total)) / win
            break
    return trajectory
