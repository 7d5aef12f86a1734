// SPDX-License-Identifier: Apache-2.0
// The haystack of `protokv demo` on an instruct model: a short story in plain English, written
// for this project (so it ships with the code under the project's licence, needs no download, and
// no model can have memorised it). It has no digits, so the planted 7-digit value is the only
// number in the prompt, and its sentences end with '.', where the needle is inserted.
#include <string_view>

#include "eval/demo.h"

namespace protokv::eval {

std::string_view demo_story() {
  return R"story(The ferry left the mainland a little after dawn, when the water in the harbour was still the colour of slate and the gulls had not yet decided whether the day was worth their trouble. Marta stood at the rail with her coat buttoned to the chin and watched the town shrink behind her: the grey church, the warehouses with their painted doors, the long wall where the fishermen mended their nets in summer. She had lived there for eleven years and had never once taken the boat to the island, although she had watched it come and go twice a day from the window of the bakery where she worked.

The island had no proper name on the old charts. People in town called it the Shelf, because from the shore it looked like a plank laid flat on the sea, and because nobody could remember anything growing on it taller than a bramble. A lighthouse keeper had lived there once, and after him a family who raised sheep and sold the wool to a mill further up the coast. Now there was only a small school for children from the scattered farms, a post office that opened on Tuesdays, and a library that was said to hold more books than the one in town.

It was the library that Marta had come to see. Her grandmother had left her a box of letters, tied with string and smelling faintly of cedar, and one of the letters mentioned a ledger kept in the island library: a record of every ship that had sheltered in the cove during the storms of one hard winter long ago. Her great-grandfather, the letter said, had been the captain of one of those ships. Nobody in the family had ever seen the ledger, and nobody had ever thought to look.

The crossing took most of the morning. The wind came round from the north and the ferry rolled in a slow, patient way that made the other passengers go quiet. There were only a handful of them: a man carrying a crate of tools, two teachers returning from a weekend on the mainland, and an elderly woman with a basket of eggs on her knees, who told Marta that she had made the same journey every week for forty years and had never been seasick, not once, because she never looked at the horizon.

When they landed, the teachers walked off together along the only road, and the man with the crate was met by a boy with a cart. The old woman pointed Marta up the hill. The library, she said, was the building with the green shutters, and the librarian was a man called Tobias who talked too much but knew where everything was.

The building with the green shutters had once been the lighthouse keeper's house. Inside it smelled of wax polish and damp paper. Shelves ran from the floor to the ceiling in every room, even in the narrow hallway, and there were books stacked on the stairs. Tobias turned out to be tall and thin, with spectacles pushed up on his forehead, and he did talk a great deal. He talked about the winter the roof had leaked, about the summer a student from the university had catalogued the maps, about the difficulty of keeping paper dry on an island where the fog came in every evening like a tide.

When Marta finally explained what she was looking for, he stopped talking and looked at her for a long moment. Then he went into a back room and came out with a ledger bound in cracked brown leather. He set it on the table by the window and opened it carefully, as though it might fall apart in the light.

The pages were ruled in faded red ink. Each line gave the name of a ship, the name of her master, the port she had sailed from and the day she had come into the cove. Some entries had a second note in a different hand: the day the ship had left again, or a single word, lost, written small at the edge of the page. Marta read slowly, following the lines with her finger, while Tobias made tea on a stove in the corner and, for once, said nothing at all.

She found the name halfway down the third page. The ship was a coastal schooner carrying timber, and the master's name was the same as the one on her grandmother's letters. The schooner had come into the cove in the middle of a gale and had stayed for nine days while the crew repaired a split mast. Beside the entry, in the second hand, someone had written that the captain had helped to rebuild the island's jetty before he sailed, and that the islanders had given him a barrel of salted fish and a pair of knitted gloves in thanks.

Marta sat back in her chair. Outside the window the fog was beginning to gather over the water, softening the line between the sea and the sky. She thought about the jetty she had walked along that morning, its stones worn smooth and dark, and wondered whether any of them had been set in place by the man in the ledger. It seemed unlikely after so many years, and yet the jetty was still there, and so was the book that remembered it.

Tobias asked whether she would like a copy of the page. He had a camera, he said, a good one, left behind by the student who had catalogued the maps. Marta said she would, and while he fetched it she read the rest of the entries for that winter. There were nineteen ships in all. Three of them had been lost on the rocks beyond the point. The others had sailed away when the weather turned, to ports whose names she half recognised from the signs on the old warehouses in town.

The last ferry of the day left at four. Marta walked down the hill with the photographs in an envelope inside her coat, past the school, where the children were being collected by their parents, and past the post office, which was closed because it was not Tuesday. The old woman with the eggs was waiting on the jetty, her basket empty now, and she asked whether Marta had found what she came for.

Marta said that she had. On the crossing back the wind had dropped, the sea was flat and bright, and the town came slowly into view: the grey church, the warehouses, the long wall, the window of the bakery where the lights were already on. She looked at the horizon the whole way, and she was not seasick either.)story";
}

}  // namespace protokv::eval
